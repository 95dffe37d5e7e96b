"""PostgreSQL functions for the ledger's common path: a hold, and a charge/settle/release against a hold, each
one call in one transaction (services.ledger.repository: place_hold_in_one_call and take_in_one_call)

Revision ID: 7b1e2c9d4f10
Revises: e0d8d49b9b03
Create Date: 2026-11-30 05:35:00
"""
from alembic import op


revision = '7b1e2c9d4f10'
down_revision = 'e0d8d49b9b03'
branch_labels = None
depends_on = None

# Both functions apply the same rules as the general path in Python: the account row is locked first, the
# balance or the hold is checked in the conditional UPDATE, entries and cached totals are written together,
# and the idempotency record is inserted last (a duplicate key raises a unique violation, which rolls the
# whole call back). They return false / NULL when the common path does not apply (no account, not enough
# money, no such hold, the hold closed or too small); the caller then takes the general path, which
# raises the right error or replays a stored answer.
HOLD = """
CREATE FUNCTION crucible_ledger_hold(p_account text, p_amount bigint, p_hold text, p_entry text, p_purpose text, p_price_version text,
                                     p_key text, p_fingerprint text, p_response text, p_now timestamptz, p_expires timestamptz)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    UPDATE accounts SET held_usd_micros = held_usd_micros + p_amount, updated_at = p_now
     WHERE account_id = p_account AND budget_usd_micros - held_usd_micros - spent_usd_micros >= p_amount;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO holds (hold_id, account_id, amount_usd_micros, charged_usd_micros, released_usd_micros, status, purpose, price_version,
                       created_at, expires_at)
    VALUES (p_hold, p_account, p_amount, 0, 0, 'open', p_purpose, p_price_version, p_now, p_expires);
    INSERT INTO entries (id, account_id, type, amount_usd_micros, hold_id, purpose, price_version, idempotency_key, created_at)
    VALUES (p_entry, p_account, 'hold', p_amount, p_hold, p_purpose, p_price_version, p_key, p_now);
    INSERT INTO idempotency_records (account_id, operation, key, fingerprint, response, created_at)
    VALUES (p_account, 'hold.create', p_key, p_fingerprint, p_response, p_now);
    RETURN true;
END $$
"""

TAKE = """
CREATE FUNCTION crucible_ledger_take(p_hold text, p_total bigint, p_close_as text, p_lines jsonb, p_release_entry text, p_purpose text,
                                     p_price_version text, p_key text, p_operation text, p_fingerprint text, p_now timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_account text;
    h holds%ROWTYPE;
    v_released bigint := 0;
    v_response text;
BEGIN
    SELECT account_id INTO v_account FROM holds WHERE hold_id = p_hold;
    IF v_account IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM accounts WHERE account_id = v_account FOR UPDATE;
    UPDATE holds
       SET charged_usd_micros = charged_usd_micros + p_total,
           released_usd_micros = CASE WHEN p_close_as IS NULL THEN released_usd_micros ELSE amount_usd_micros - charged_usd_micros - p_total END,
           status = COALESCE(p_close_as, status),
           closed_at = CASE WHEN p_close_as IS NULL THEN closed_at ELSE p_now END
     WHERE hold_id = p_hold AND status = 'open' AND amount_usd_micros - charged_usd_micros - released_usd_micros >= p_total
    RETURNING * INTO h;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_close_as IS NOT NULL THEN
        v_released := h.released_usd_micros;
    END IF;
    INSERT INTO entries (id, account_id, type, amount_usd_micros, kind, quantity, model, hold_id, purpose, price_version, idempotency_key, created_at)
    SELECT l.id, v_account, 'charge', l.amount, l.kind, l.quantity, l.model, p_hold, COALESCE(p_purpose, h.purpose), p_price_version, p_key, p_now
      FROM jsonb_to_recordset(p_lines) AS l(id text, amount bigint, kind text, quantity bigint, model text);
    IF v_released > 0 THEN
        INSERT INTO entries (id, account_id, type, amount_usd_micros, hold_id, purpose, price_version, idempotency_key, created_at)
        VALUES (p_release_entry, v_account, 'release', v_released, p_hold, h.purpose, p_price_version, p_key, p_now);
    END IF;
    UPDATE accounts SET held_usd_micros = held_usd_micros - p_total - v_released, spent_usd_micros = spent_usd_micros + p_total, updated_at = p_now
     WHERE account_id = v_account;
    v_response := json_build_object(
        'hold_id', h.hold_id, 'account_id', h.account_id, 'amount_usd_micros', h.amount_usd_micros, 'charged_usd_micros', h.charged_usd_micros,
        'released_usd_micros', h.released_usd_micros, 'status', h.status, 'purpose', h.purpose, 'price_version', h.price_version,
        'created_at', h.created_at, 'expires_at', h.expires_at, 'closed_at', h.closed_at)::text;
    INSERT INTO idempotency_records (account_id, operation, key, fingerprint, response, created_at)
    VALUES (v_account, p_operation, p_key, p_fingerprint, v_response, p_now);
    RETURN v_response;
END $$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(HOLD)
        op.execute(TAKE)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS crucible_ledger_take(text, bigint, text, jsonb, text, text, text, text, text, text, timestamptz)")
        op.execute("DROP FUNCTION IF EXISTS crucible_ledger_hold(text, bigint, text, text, text, text, text, text, text, timestamptz, timestamptz)")
