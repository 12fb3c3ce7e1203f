"""Host software: the block compiler, the instruction-level functional simulator and the PC
clients of the board designs. Imports the contracts and :mod:`golden` only, never gateware.
"""
