from agent.cli import agent_cli

agent_cli(prog_name="python -m agent")
