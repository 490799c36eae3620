"""Pure rules of treadle: states, retry policy, graphs, serialized DAG versions. No I/O, no clock."""
