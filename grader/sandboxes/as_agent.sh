#!/bin/sh
# /run/crucible/as-agent COMMAND...: run COMMAND as the unprivileged `agent` user (uid and gid 65534, no groups, no
# capabilities). A task's verifier runs as root in its sandbox; it runs what the agent wrote, and reads what the agent
# may have configured (a repository's .git/config), through this, so that agent code cannot write the verifier's
# reward or change its tests.
exec setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all -- "$@"
