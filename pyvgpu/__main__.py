from pyvgpu.entry import main

main()
