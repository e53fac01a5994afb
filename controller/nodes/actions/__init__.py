"""What each action means (apply, in one transaction), the runner that carries it out, what follows it, fold reports."""
