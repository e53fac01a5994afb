"""Pagers that reach people: Slack and a generic JSON webhook (the console pager is in controller.act.actuators)."""
