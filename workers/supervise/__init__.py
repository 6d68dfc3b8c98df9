"""Process supervision on torch.distributed.elastic (`noloco-rt launch`)."""
