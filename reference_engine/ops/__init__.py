"""Operations the model composes: one module per family, each public op naming the contract it satisfies."""
