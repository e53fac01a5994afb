"""The controller: receives signals, decides (purely) what they mean, and carries out actions."""
