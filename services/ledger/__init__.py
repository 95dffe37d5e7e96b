"""The budget ledger: accounts, holds, append-only entries, the price table and usage events."""
