"""bsa: test data and verdicts for aclnnBlockSparseAttentionGrad."""

__version__ = "0.1.0"
