"""`python -m pyvgpu.cli`: the typer command line always, even for a plain wrap (the tests compare the two)."""

from pyvgpu.cli.root import main

main()
