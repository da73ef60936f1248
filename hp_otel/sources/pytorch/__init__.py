"""PyTorch sources: DTensor ops and redistributes, collectives (kernels or a dispatch mode),
their completion, FSDP2 parameter groups and `nn.Module` calls, reported to the observer."""
