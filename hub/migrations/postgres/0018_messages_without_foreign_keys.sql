-- Every message written checked that its chat exists (and an agent's
-- message its agent) with a foreign key's trigger: a query of its own per
-- row (`SELECT … FOR KEY SHARE`), run at the end of each batch's statement,
-- about 5 % of the server's CPU in the channel benchmark (2026-12-03). The
-- writers take a message's chat from the row they found under its locks in
-- the same transaction (a customer's live chat, an agent batch's chats),
-- and chats are deleted only with their client, which deletes their
-- messages itself (`store/crm/clients.rs` `delete`), so the check guarded
-- nothing they do not. SQLite keeps its keys: there the check is an index
-- lookup in the same process.
ALTER TABLE messages DROP CONSTRAINT messages_chat_id_fkey;
ALTER TABLE messages DROP CONSTRAINT messages_agent_id_fkey;
