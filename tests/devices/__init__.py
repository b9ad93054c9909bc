"""The devices (bsa_cli/devices/): reference device, binary contract, torch_npu, repeats, the C++ harness."""
