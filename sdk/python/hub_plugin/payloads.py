"""Payload types of every event kind (generated; see sdk/gen_payloads.py)."""
