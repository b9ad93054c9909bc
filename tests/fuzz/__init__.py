"""bsa fuzz: the case sequence, shrinking, the shape faults it finds, repros `bsa check` reproduces."""
