from pyvgpu.fastwrap import main

main()
