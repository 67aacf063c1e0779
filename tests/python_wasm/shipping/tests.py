# ruff: noqa: F821 - calculate_shipping is defined by the snippet these tests run against
assert calculate_shipping(5.0, "zone_3") == 12.50
assert calculate_shipping(2.0, "zone_1") == 8.00
