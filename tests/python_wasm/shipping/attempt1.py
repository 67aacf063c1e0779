import csv


def calculate_shipping(weight_kg, zone):
    with open("rate_card.csv", newline="") as f:
        for row in csv.DictReader(f):
            if float(row["weight_kg"]) == weight_kg and row["zone"] == zone:
                return float(row["cost_usd"])
    raise ValueError(f"no rate for {weight_kg} kg to {zone}")
