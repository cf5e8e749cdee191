"""The lab: the CPU test bed and its study, a package above sweet (testbed/README.md).

colbench, simulators and sweet import nothing from here: their registries name the lab's
classes by "module:Name" strings loaded on use (colbench.registry).
"""
