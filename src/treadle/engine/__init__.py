"""Use cases over the store and the domain: each one short transaction; the only state writer."""
