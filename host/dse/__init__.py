"""``ndpim dse``: design-space exploration of the PLoRA NDP core under an area / power budget (issue 34 item 4).

host.dse.space (the axes and grids), host.dse.price (one point: area, power, throughput), host.dse.pareto (the
front), host.dse.cli (the command, its table, figure and Verilog checks); docs/dse.md.
"""
