"""What `bsa gen` draws: inputs and block masks, stress data, random streams, 16-bit rounding, gen at scale."""
