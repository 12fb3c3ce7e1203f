"""The nano-KPU top level: the units behind an AXI4-Lite register slave, an AXI4 memory master
and a data scratchpad, run by an instruction set (:mod:`nanokpu.isa`). Imports the units and
the contracts.
"""
