"""The demo shop: products with stock, orders, and a flash sale."""
