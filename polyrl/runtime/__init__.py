"""The machine: devices (every CUDA check), threads, CPU matmul routing, precision, compilation, host
memory, data-parallel groups and the local Ray cluster."""
