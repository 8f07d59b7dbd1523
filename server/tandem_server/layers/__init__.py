"""Model building blocks shared by every family: linears, embeddings, norms, rotary, attention."""
