from radixchat.cli import run

run()
