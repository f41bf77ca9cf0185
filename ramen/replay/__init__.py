"""The replay's own wing: its typed key values (contract), the client that asks for a replay and
reads its result (client), and the planning of which archives answer it (plan)."""
