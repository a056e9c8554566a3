"""Decisions -> commands on the wire, and the commands' lives until they are acknowledged.

:class:`CommandBook` turns a guarded :class:`agent.decision.Decision` into the commands that change
what differs from what the racks have: per rack and setting one ``racktwin.rack_cmd/1`` (a DVFS level
per distinct level, low-power idle, wake, and ONE power-limit command per rack and direction whose
``power_limit_watts`` is a value per card when the cards' limits differ: a rack gets a handful of
commands per decision, not one per distinct limit), one ``racktwin.facility_cmd/1`` for a new
set-point, one ``racktwin.scheduler_cmd/1`` per placement, one ``racktwin.cdu_cmd/1`` per rack whose
pump speed changes (and, for a slowed pump, again at the first decision ``pump_renew_s`` or more after
the last: the plant returns a pump to full speed when no command renews it). Where the decision manages
hosts (``Decision.host_off``), one
``host_power_off`` per rack listing every card of the hosts to switch off that the racks report on
(never a host with a busy card: the plant would refuse it) and one ``host_power_on`` for hosts to
switch on that are reported off; the cards of hosts that are (to be) off get no low-power idle or
wake (they are asleep with their host; a wake would boot it). A card whose host is reported or
commanded off counts as asleep whatever the racks last said of the card: a host powered on again
boots with its cards asleep, so they get a wake after the power-on where the decision wants them
awake, and never a sleep (which the rack, its host still off, would refuse). "What the racks have" is what they
report (telemetry, retained applied state) overlaid with the agent's own open commands until they
expire, so a command is not repeated every period while telemetry catches up. Commands that lower
power (slower levels, lower limits, host power-off, sleep, faster pumps) come first, then the set-point
and placements, then the ones that raise power or die temperatures (faster levels, host power-on,
wake, slower pumps): a rack applies its commands in order, so it never passes through a state above
both plans.

Every command carries a fresh id, its issue time and an absolute expiry (``command_ttl_s`` later,
site time, at most ``wire.MAX_COMMAND_TTL_S``: a rack refuses a longer life), goes at QoS 1 and is
never retained (``agent.wire``). Issue times never go back: when the agent's clock steps back (it ran
ahead of a site that slowed during a silence: ``agent.clock``), the next commands keep the newest
issue time given so far, ordered after it by ``seq``, so that racks do not refuse them as
``superseded`` by the agent's own earlier commands until the site's clock has caught up (seen: 45
site s of refusals at 20x). The hold is bounded by how far ahead of its clock a rack accepts a
command (half of it: :meth:`CommandBook.stamp_hold_s`); a larger step back (a restarted simulator,
a clock set back by hours) stamps the clock's time again. Commands re-opened from the journal after
a restart count as given. Open commands stamped more than a rack accepts ahead of the clock after it
stepped back are closed at once, as expired (:meth:`CommandBook.expire`: no rack applies them, and
their expiries on the old timeline would hold what they set for as long as the step). The book
keeps each open command (topic, payload, expiry, attempts).
An ack ``applied`` closes it; ``rejected`` or ``expired`` closes it and lets the next decision try
again (after ``command_ttl_s`` for a rejected setting of a card, so that a refusal is not repeated
every period, the decisions' guard keeping that setting as the card reports it meanwhile:
``Overlays.held_back``; at once, less the failed card, when a card of the refused command reads failed since:
a rack refuses a command whole for one failed card; at once for a refusal as ``superseded``: the
rack holds a newer command; a placement at once: the service tells the controller's
``agent.placing.PlacementBook`` too, ``Controller.placement_refused``). Cards of hosts that are
(reported or commanded) off get no level or power-limit commands: the rack cannot reach them and
refuses them (``host_off``); the next decision after the host is on sends them.
Nor do the cards of hosts the same decision powers off (a faster
level after the power-off would be refused). The same diff, unregistered, is the advice of advisory mode
(:meth:`CommandBook.advice`).

A newer command for what an open command sets (a card's level, its power limit, its power state: a
sleep or wake an older sleep or wake, a host power command an older one or a sleep or wake of its
cards; a rack's pump; the set-point) supersedes it: the open one is closed at once
(:attr:`CommandBook.superseded`, ``superseded`` to the publisher) and never sent again, not even for
its cards the newer one does not list (their overlay is cleared: the next decision commands them
again unless the racks report them so), nor a copy already queued (:class:`Publisher` checks, as each
send runs, that its command is still open). A decision the journal refuses is not acted on: the
service takes its commands back (:meth:`CommandBook.undo`), and the commands they superseded are open
again as they were. A retry of an old command after a newer one would otherwise
undo the newer one on a rack that applies what it gets (acks lost to a broker ACL: re-sends put 16
cards back at full clock and the rack 2% over its limit); a rack that follows docs/protocol.md
refuses such an old command (``superseded``) anyway.

:class:`Publisher` sends what the book hands it, in order and pipelined (a batch of up to the client's
in-flight window is handed to the client at once and the broker's PUBACKs are awaited together, so a
decision's commands leave within one round trip instead of one round trip each), and retries: a command not acknowledged
``command_ttl_s / (command_retries + 1)`` after it was sent is sent again, at most
``command_retries`` times, never after its expiry; every open command is sent again after the broker
connection comes back (a broker restarted without persistence forgets what it had not delivered).
The sends of a batch are journaled in one transaction (``Journal.mark_sent``) after the broker
acknowledged them; the commands themselves were journaled before, with their decision. A journal
write of the publisher that fails (a full disk: ``JournalError``) does not stop it: the commands were
journaled before they were sent, so what is lost is their record of being sent (a restarted agent
sends again what its journal still has open and valid, and closes the rest); a close (``abandoned``,
``superseded``, or ``expired`` because the site clock stepped back) is kept and written by the next
step whose write succeeds (plain expiries by the journal's next expiry pass) or at shutdown, as
otherwise a restarted agent would send a closed command again (:meth:`Publisher.unjournaled_closes`
counts those waiting: the service's ``/readyz``).
A command superseded by a newer one is journaled ``superseded``, counted in
:attr:`PublishStats.superseded` and reported as closed ``superseded``. A command closed without
an ack although it went out a retry interval before (expired, abandoned or superseded) is an ack
missing: counted per target (:attr:`Publisher.acks_missing`) and logged as a warning, at
most once a minute per target (acks dropped by a broker ACL are otherwise silent), unless the
target has been silent since the command first went out (``heard_since``: its telemetry stopped
too, which has its own signs: stale telemetry, fail-safe caps; a simulator that ended).
The failure is logged once and kept in :attr:`Publisher.journal_errors` (the service's ``/readyz``;
one entry per kind of write: ``sent``, the expiry pass, each state of close) until the same write
succeeds again (any error, once a batch is marked sent); for 2 s after a failure
the publisher does not try its journal writes (each try may wait for SQLite's busy timeout).

The modules: ``agent.open_commands`` (:class:`OpenCommand`, the kinds of card setting, what
supersedes what), ``agent.command_overlays`` (what the open commands will have set, what refusals
hold back), ``agent.command_diff`` (the commands a decision needs), ``agent.command_book``
(:class:`CommandBook`: registering, superseding, acks, expiry, advice) and ``agent.publisher``
(:class:`Publisher`: sending, retries, missing acks). This module re-exports what the rest of the
agent uses.
"""

from __future__ import annotations

from agent.command_book import CommandBook
from agent.open_commands import OpenCommand, new_commands
from agent.publisher import Publisher, PublishStats

__all__ = ["CommandBook", "OpenCommand", "PublishStats", "Publisher", "new_commands"]
