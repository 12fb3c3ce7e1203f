"""Board designs' gateware: UART bridges that put a unit (:mod:`nanokpu.board.uart_bridge`) or
the whole nano-KPU with an on-chip host memory (:mod:`nanokpu.board.uart_axil`) on a serial
line. Their byte protocols are contracts (:mod:`nanokpu.bridge_protocol`,
:mod:`nanokpu.host_protocol`) that the host clients read too.
"""
