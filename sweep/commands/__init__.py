"""One Typer sub-app (or command) per module. Modules import torch and Ray only inside commands."""
