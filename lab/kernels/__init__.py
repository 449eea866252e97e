"""One module per kernel family; each registers itself with `lab.registry` when imported.

`lab.registry.families()` imports every module here, so adding a family is adding a file.
"""
