"""The Celery app of peers.py: one task that runs `sh -c CMD` (its broker and results on PEERS_BROKER)."""

import os
import subprocess

from celery import Celery

app = Celery("celery_cells", broker=os.environ.get("PEERS_BROKER"), backend=os.environ.get("PEERS_BROKER"))
app.conf.update(task_acks_late=False, worker_prefetch_multiplier=1, result_expires=600, broker_connection_retry_on_startup=True)


@app.task
def cell(cmd):
    return subprocess.run(["sh", "-c", cmd]).returncode


@app.task
def talk(url, tools, i):
    import conversation

    return conversation.run(url, tools, i)
