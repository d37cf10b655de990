"""Beyond-the-spec strategies, each chosen once at construction from its setting."""
