"""DRAM organisation and timing, the command set, and synthesizable memory controllers."""
