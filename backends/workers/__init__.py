"""Worker processes for any runtime: the link, exits, the tensor worker, shared memory."""
