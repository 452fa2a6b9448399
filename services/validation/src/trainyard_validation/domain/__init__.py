"""Pure validation rules: no I/O."""
