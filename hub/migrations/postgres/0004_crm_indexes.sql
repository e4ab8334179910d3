-- Lookups the CRM makes by columns that are not keys: clients by category and
-- organization (moving them when one is deleted, list filters), clients by tag
-- (merging, filters), tasks by client and deal, deals by pipeline, stage and
-- reject reason. The last ones also serve the foreign-key checks when a deal,
-- stage or reason is deleted (PostgreSQL does not index referencing columns
-- by itself either).
CREATE INDEX clients_status ON clients(status_id);
CREATE INDEX clients_organization ON clients(organization_id);
CREATE INDEX crm_client_tags_tag ON crm_client_tags(tag_id);
CREATE INDEX crm_tasks_client ON crm_tasks(client_id);
CREATE INDEX crm_tasks_deal ON crm_tasks(deal_id);
CREATE INDEX crm_deals_pipeline ON crm_deals(pipeline_id);
CREATE INDEX crm_deals_stage ON crm_deals(stage_id);
CREATE INDEX crm_deals_reject_reason ON crm_deals(reject_reason_id);
