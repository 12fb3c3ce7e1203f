"""The gateware units: Amaranth ``wiring.Component``\\ s with stream interfaces.

The systolic array and its GEMM engine, the requantiser, the PWL activation units (sigmoid,
SiTU-GLU, exp, SiLU, KDA decay), the top-k router, the vector unit and their parts (processing
element, DSP multiplier, sequential divider, scratchpad read ports). A unit imports only the contracts
(:mod:`nanokpu.config`, :mod:`nanokpu.isa`, :mod:`nanokpu.gemm_layout`) and
:mod:`golden.intops` (its ROM tables); it never imports the top level, a board or the host.
"""
