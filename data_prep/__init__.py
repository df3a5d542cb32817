"""Raw review dumps -> one store -> evaluation tasks + ground truth -> training pairs."""
