"""Datasets (registry, readers, synthetic generators), partitions, sampling, micro-batches."""

from gnnpar.data.datasets import REGISTRY, GraphDataset, ImageDataset, load_dataset

__all__ = ["REGISTRY", "GraphDataset", "ImageDataset", "load_dataset"]
