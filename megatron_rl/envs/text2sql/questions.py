"""Questions with gold queries over a generated database; parameters are drawn from its rows."""

from __future__ import annotations

import random


def _column(spec: dict, table: str, index: int) -> list:
    return [row[index] for t in spec["tables"] if t["name"] == table for row in t["rows"]]


def _company(spec: dict, rng: random.Random) -> tuple[str, str]:
    dept = rng.choice(_column(spec, "departments", 1))
    city = rng.choice(_column(spec, "departments", 2))
    salary = rng.choice(_column(spec, "employees", 3))
    year = rng.choice(_column(spec, "employees", 4))
    return rng.choice([
        (f"How many employees work in the {dept} department?",
         "SELECT COUNT(*) FROM employees e JOIN departments d ON e.department_id = d.id "
         f"WHERE d.name = '{dept}'"),
        (f"List the names of employees earning at least {salary}, highest salary first (ties by name).",
         f"SELECT name FROM employees WHERE salary >= {salary} ORDER BY salary DESC, name"),
        ("What is the average salary of the employees in each city? Give city and average.",
         "SELECT d.city, AVG(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id GROUP BY d.city"),
        (f"Which employees in {city} were hired in {year} or later? Give their names.",
         "SELECT e.name FROM employees e JOIN departments d ON e.department_id = d.id "
         f"WHERE d.city = '{city}' AND e.hire_year >= {year}"),
        ("What is the total project budget of each department that has projects? Give name and total.",
         "SELECT d.name, SUM(p.budget) FROM departments d JOIN projects p ON p.department_id = d.id GROUP BY d.id"),
    ])


def _shop(spec: dict, rng: random.Random) -> tuple[str, str]:
    country = rng.choice(_column(spec, "customers", 2))
    category = rng.choice(_column(spec, "products", 2))
    year = rng.choice(_column(spec, "orders", 4))
    return rng.choice([
        (f"How many orders were placed by customers from {country}?",
         f"SELECT COUNT(*) FROM orders o JOIN customers c ON o.customer_id = c.id WHERE c.country = '{country}'"),
        (f"What is the total quantity ordered of products in the category '{category}'?",
         "SELECT SUM(o.quantity) FROM orders o JOIN products p ON o.product_id = p.id "
         f"WHERE p.category = '{category}'"),
        (f"List the names of the products in the category '{category}', cheapest first (ties by name).",
         f"SELECT name FROM products WHERE category = '{category}' ORDER BY price, name"),
        (f"Which customers placed an order in {year}? Give each name once.",
         f"SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id WHERE o.order_year = {year}"),
        ("How much revenue (price times quantity) did each country bring? Give country and revenue.",
         "SELECT c.country, SUM(p.price * o.quantity) FROM orders o JOIN customers c ON o.customer_id = c.id "
         "JOIN products p ON o.product_id = p.id GROUP BY c.country"),
    ])


QUESTIONS = {"company": _company, "shop": _shop}


def make_question(spec: dict, rng: random.Random) -> tuple[str, str]:
    """A natural-language question about ``spec`` and its gold SQLite query."""
    return QUESTIONS[spec["domain"]](spec, rng)
