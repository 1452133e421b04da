from pyvgpu.cli import main

main()
