"""What DAG authors import: decorators, specs, the task context, and the DAG-folder loader."""
