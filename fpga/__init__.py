"""Open FPGA flows for nano-KPU: Yosys + nextpnr (YoWASP) for iCE40 UP5K and ECP5.

:func:`fpga.flow.synthesize` is the entry point: an Amaranth component in, a report dict out
(resources, latches, unmapped cells, and with ``pnr=True`` Fmax and the critical path).
"""
