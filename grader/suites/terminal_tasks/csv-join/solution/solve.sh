#!/bin/bash
set -e
python3 - <<'PY'
import csv

with open("/app/customers.csv", newline="") as f:
    customers = {row["customer_id"]: row for row in csv.DictReader(f)}
with open("/app/orders.csv", newline="") as f:
    orders = sorted(csv.DictReader(f), key=lambda row: int(row["order_id"]))
with open("/app/order_report.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["order_id", "customer_name", "country", "amount"])
    for order in orders:
        customer = customers.get(order["customer_id"])
        if customer:
            writer.writerow([order["order_id"], customer["name"], customer["country"], order["amount"]])
PY
