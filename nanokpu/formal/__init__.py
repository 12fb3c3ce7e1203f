"""Formal-only wrappers (Assert/Assume/Cover around the RTL units) and the SymbiYosys flow."""
