"""Pipeline stages: plain typed functions, collaborators passed in as arguments."""
