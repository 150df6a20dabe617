/*
 * The gossip pairing protocol and the work pool as a Promela model, checked with SPIN.
 *
 * N ranks run gnnpar's training loop under --strategy gossip (topology AnyPeer) or, with
 * -DBIPARTITE, gossip-bipartite; with -DCHECKPOINT, --checkpoint-every 1 (each epoch's end but
 * the last pauses gossip, passes a barrier and reopens, as loop.train's save() does). Each rank
 * runs the code's own steps, in the code's order:
 *   loop.train, sources.PoolSource         -> the epoch loop; take, train, hold a later epoch's item
 *   parallel/gossip/pool.py WorkPool.take  -> one atomic store.add on the pool counter (label take)
 *   training/gossip_sync.py GossipSync     -> boundary(), serve(), pause() and the final barrier
 *   parallel/gossip/protocol.py Pairing    -> at_boundary, _pick, _serve, _if_ready, finish, retire
 * The docstring of parallel/gossip/protocol.py maps each step of the code to its label here.
 *
 * The store: each TCPStore operation (get, set, compare_set, add) is one atomic step, as the
 * store serialises them; nothing else is atomic. Rank r's key state/r holds kind[r] and, for
 * claim:A:X and ready:A:X, who[r] = A and num[r] = X's counter (the xid is "A.num").
 * compare_set(key, expected, desired) returns the value after the call: desired if the key held
 * expected, else the key's value. A rank's purely local work is folded into an adjacent
 * store step (nobody else can see it): a smaller state space, and no behaviour lost.
 *
 * What is abstracted, and why no behaviour of the code is lost:
 * - want (K steps since the last exchange): the model always picks and lets every pick give up
 *   at once (busy, then avail again). A boundary with want=False has the same effect on the
 *   store as such a pick, so this covers every --sync-every, and the picker's re-pick after its
 *   exchange (K = 1) too.
 * - _not_faster (the step-time filter) and rng.shuffle: the picker may claim any candidate that
 *   is avail when its compare_set runs, or give up. A failed compare_set changes nothing, and
 *   which candidates the filter keeps depends on timing, so every choice can happen.
 * - Polling (retire's wait for its pick to be ready, every 1 ms) is a blocking guard: a failed
 *   poll reads and changes nothing, so a poll that could spin forever is a blocked state here.
 * - exchange_average (isend, irecv, wait on both) is a send on a buffered channel to the partner
 *   and a receive from it. The message carries the xid, so both sides must be in the same
 *   exchange; the tensors themselves do not matter to the protocol.
 * - Timeouts (--timeout) only turn a crashed or stalled partner into an error. The model has no
 *   faults: it checks that no wait ever needs a timeout to end.
 * - The step-time keys (record_step, _not_faster's reads) never change a state key.
 * - Pool positions stand for subgraphs: a position's subgraph is order(epoch)[offset], a
 *   permutation per epoch (tests/parallel/test_gossip.py), so "each position once" is "each subgraph
 *   once per epoch".
 *
 * What is checked (tests/parallel/test_gossip_model.py, 2, 3 and 4 ranks, both topologies, with and
 * without checkpoints):
 * - safety (pan compiled with -DSAFETY -DNOCLAIM): no assertion fails and no invalid end state
 *   (a deadlock). The assertions: a claim pairs two distinct ranks, neither in an exchange; the
 *   two sides of an exchange name each other and the same xid; no pool position is trained
 *   twice; retire never meets a state it cannot handle; at the end every key is done, every
 *   message received and every position trained.
 * - ltl terminates: every rank passes the final barrier (no deadlock, no livelock).
 * - ltl exclusive: no rank is ever paired with itself or in two exchanges at once.
 * - ltl pool_once: every pool position is trained (exactly once, with the assertion above).
 * terminates is checked without fairness (pan -a, no -f): it holds even in executions that
 * starve some rank forever, i.e. the state graph has no cycle that avoids termination.
 *
 * By hand (N ranks, POOL subgraphs per epoch, EPOCHS epochs):
 *   spin -a -DN=3 -DPOOL=2 -DEPOCHS=2 protocol.pml && gcc -O2 -o pan pan.c
 *   ./pan -a -N terminates          (and -N exclusive, -N pool_once)
 */

#ifndef N
#define N 3
#endif
#ifndef POOL
#define POOL 2
#endif
#ifndef EPOCHS
#define EPOCHS 2
#endif
#define TOTAL (POOL * EPOCHS)
#define NONE 255

#if N < 2 || N > 4
#error "the model is written for 2 to 4 ranks"
#endif

/* Topology: who may be picked (pickable) and whom a rank may pick (CAND). */
#ifdef BIPARTITE
#define ACTIVE(r) ((r) < N / 2)
#define PICKABLE(r) (!ACTIVE(r))
#define CAND(r, c) (ACTIVE(r) && !ACTIVE(c))
#define INITIATES(r) (ACTIVE(r))
#else
#define PICKABLE(r) (true)
#define CAND(r, c) ((r) != (c))
#define INITIATES(r) (true)
#endif

/* The value of a state key (protocol.py: AVAIL, BUSY, DONE, claim:A:X, ready:A:X). */
#define AVAIL 0
#define BUSY 1
#define DONE 2
#define CLAIM 3
#define READY 4

byte kind[N];          /* the store: state/r */
byte who[N];
byte num[N];
byte counter = 0;      /* the store: the work pool's counter (WorkPool.take's store.add) */
chan link[N * N] = [1] of { byte, byte };   /* gloo point-to-point, link[from * N + to] */

/* Ghost state, for the properties only (no rank reads it). */
int trained = 0;       /* bit p: pool position p was trained */
byte inx[N];           /* exchanges rank r is in: from the claim to r's own finish */
byte mate[N] = NONE;   /* r's partner in that exchange */
byte finished = 0;     /* ranks past the final barrier */
byte arrived = 0;      /* arrivals at barriers, all barriers together */

#define ALL_TRAINED (trained == (1 << TOTAL) - 1)
#if N == 2
#define PAIRS_OK (inx[0] <= 1 && inx[1] <= 1 && mate[0] != 0 && mate[1] != 1)
#elif N == 3
#define PAIRS_OK (inx[0] <= 1 && inx[1] <= 1 && inx[2] <= 1 && \
                  mate[0] != 0 && mate[1] != 1 && mate[2] != 2)
#else
#define PAIRS_OK (inx[0] <= 1 && inx[1] <= 1 && inx[2] <= 1 && inx[3] <= 1 && \
                  mate[0] != 0 && mate[1] != 1 && mate[2] != 2 && mate[3] != 3)
#endif

ltl terminates { <> (finished == N) }
ltl exclusive { [] PAIRS_OK }
ltl pool_once { <> ALL_TRAINED }

proctype Rank(byte me)
{
    byte epoch = 0;            /* loop.train's epoch */
    byte pos;                  /* the pool position taken */
    byte held = 0;             /* PoolSource._next: 1 + the position of a later epoch's item */
    bool dry = false;          /* PoolSource._empty */
    bool pending = false;      /* Pairing.pending: our pick, its exchange not yet done */
    byte pp;                   /* pending.partner; pending.xid is "me.(claims - 1)" */
    byte claims = 0;           /* Pairing._claims */
    byte xp;                   /* the exchange to do now: partner, */
    byte xn;                   /*   xid "claimer.xn" (claimer: me if xinit, else xp), */
    bool xinit;                /*   initiated */
    bool retiring = false;     /* in GossipSync.pause's loop, rather than in boundary() */
    bool checkpointing = false;    /* pausing for a checkpoint (-DCHECKPOINT), not the end */
    byte passed = 0;           /* barriers passed */
    byte rc;                   /* a received message: the xid */
    byte rn;

next_epoch:                    /* loop.train: for epoch in range(EPOCHS) */
    if
    :: epoch == EPOCHS -> goto retire
    :: else
    fi;
step:                          /* PoolSource.epoch: the next batch, or the epoch's end */
    if
    :: dry -> goto epoch_end
    :: else
    fi;
take:                          /* item = _next, or WorkPool.take(): store.add(key, 1) - 1 */
    d_step {
        if
        :: held > 0 -> pos = held - 1; held = 0
        :: else -> pos = counter; counter++
        fi;
        if
        :: pos >= TOTAL -> dry = true                /* the pool is empty */
        :: pos / POOL > epoch -> held = pos + 1      /* a later epoch's: hold it */
        :: else ->             /* train it: forward, backward (and optimizer step) */
            assert(!(trained & (1 << pos)));        /* no position trained twice */
            trained = trained | (1 << pos)
        fi;
        pos = 0
    }
    if
    :: dry || held > 0 -> goto epoch_end
    :: else
    fi;

at_boundary:                   /* Pairing.at_boundary(want) */
    if
    :: pending ->              /* case 2: is our pick there yet? (_if_ready: one get) */
ready_poll:
        if
        :: kind[pp] == READY && who[pp] == me && num[pp] == claims - 1 ->
            xp = pp; xn = claims - 1; xinit = true; goto serve
        :: else -> goto step   /* not yet: keep training */
        fi
    :: else
    fi;
    if
    :: PICKABLE(me) ->         /* case 1: were we picked? (_serve of a get) */
serve_get:
        if
        :: atomic { kind[me] == CLAIM -> xp = who[me]; xn = num[me]; xinit = false } ->
serve_ready:
            d_step { kind[me] = READY; who[me] = xp; num[me] = xn }   /* set ready:A:X */
            goto serve
        :: else
        fi
    :: else
    fi;
    if
    :: INITIATES(me)           /* case 3 (want: see the header): Pairing._pick */
    :: else -> goto step
    fi;
pick_busy:                     /* compare_set(me, AVAIL, BUSY) == BUSY, else claimed meanwhile */
    if
    :: atomic { (kind[me] == AVAIL || kind[me] == BUSY) -> kind[me] = BUSY }
    :: else -> goto step       /* (compare_set returned a claim: served next boundary) */
    fi;
    /* The candidates are tried in random order, those with much shorter steps left out
     * (_not_faster). A failed compare_set changes nothing, so the loop amounts to: claim one
     * candidate that is avail when its compare_set runs, or none. Which candidates the filter
     * keeps depends on timing, so every choice is allowed here. */
pick_claim:                    /* compare_set(state/c, AVAIL, claim:me:X) == claim:me:X */
    /* (X is fresh and only we write claim:me:..., so c cannot hold claim:me:X already) */
    if
#define TRY(r) \
    :: d_step { \
        CAND(me, r) && kind[r] == AVAIL -> \
        assert(r != me && inx[me] == 0 && inx[r] == 0); /* a free pair of two ranks */ \
        kind[r] = CLAIM; who[r] = me; num[r] = claims; \
        inx[me]++; inx[r]++; mate[me] = r; mate[r] = me; \
        pp = r; claims++; pending = true \
    }
    TRY(0)
    TRY(1)
#if N > 2
    TRY(2)
#endif
#if N > 3
    TRY(3)
#endif
    :: true ->
pick_release:                  /* nobody (left) available: set(me, AVAIL) */
        d_step { kind[me] = AVAIL; who[me] = 0; num[me] = 0 }
    fi;
    goto step;                 /* keep training: a partner answers at its next boundary */

serve:                         /* GossipSync.serve: exchange_average, then Pairing.finish */
exchange_send:                 /* dist.isend: the xid stands for the tensors */
    atomic {
        link[me * N + xp] ! (xinit -> me : xp), xn;
        assert(xp != me && mate[me] == xp)           /* the partner we were paired with */
    }
exchange_recv:                 /* dist.irecv, wait: both sides must be in the same exchange */
    d_step {
        link[xp * N + me] ? rc, rn;
        assert(rn == xn && rc == (xinit -> me : xp));
        rc = 0; rn = 0
    }
finish:                        /* Pairing.finish: pending = None (claimer), set(me, AVAIL) */
    d_step {
        if
        :: xinit -> pending = false; pp = 0
        :: else
        fi;
        kind[me] = AVAIL; who[me] = 0; num[me] = 0;
        inx[me]--; mate[me] = NONE;
        xp = 0; xn = 0
    }
    if
    :: retiring -> xinit = false; goto retire
    :: !retiring && xinit ->   /* boundary(): a picker may pick again at once (K = 1) */
        xinit = false; goto at_boundary
    :: else -> goto step
    fi;

epoch_end:                     /* sync.end_epoch: nothing for gossip */
    epoch++;
#ifdef CHECKPOINT
    if                         /* --checkpoint-every 1: loop.train's save(), but after the last */
    :: epoch < EPOCHS -> checkpointing = true; goto retire   /* sync.pause() */
    :: else
    fi;
#endif
    goto next_epoch;

retire:                        /* GossipSync.pause: x = Pairing.retire() until None */
    retiring = true;
    if
    :: pending ->
retire_wait:                   /* at_boundary(want=False), polled until our pick is ready */
        kind[pp] == READY && who[pp] == me && num[pp] == claims - 1 ->
            xp = pp; xn = claims - 1; xinit = true; goto serve
    :: else
    fi;
retire_done:                   /* compare_set(me, AVAIL, DONE), then _serve of its answer */
    if
    :: atomic { (kind[me] == AVAIL || kind[me] == DONE) -> kind[me] = DONE }   /* to barrier */
    :: atomic { kind[me] == CLAIM -> xp = who[me]; xn = num[me]; xinit = false } ->
retire_ready:                  /* a claim is pending: serve it (the study's clean-up) */
        d_step { kind[me] = READY; who[me] = xp; num[me] = xn }
        goto serve
    :: else -> assert(false)   /* retire's RuntimeError: an unexpected state */
    fi;

barrier:                       /* GossipSync.finish: clock.barrier() (or a checkpoint's) */
    d_step { arrived++; passed++ }
    (arrived >= N * passed);   /* every rank passes the same barriers: a count suffices */
#ifdef CHECKPOINT
    if
    :: checkpointing ->        /* checkpoint written: sync.unpause() */
unpause:                       /* Pairing.open: set(me, AVAIL) */
        d_step { kind[me] = AVAIL; checkpointing = false; retiring = false }
        goto next_epoch
    :: else
    fi;
#endif
    d_step { finished++ }
}

init
{
    byte r;
    atomic {
        r = 0;
        do                     /* Pairing.open on every rank, then the barrier */
        :: r < N -> kind[r] = AVAIL; r++
        :: else -> break
        od;
        r = 0;
        do
        :: r < N -> run Rank(r); r++
        :: else -> break
        od
    }
    (finished == N);
    r = 0;
    do                         /* the end: everybody done, every message read, pool empty */
    :: r < N ->
        assert(kind[r] == DONE && inx[r] == 0);
        r++
    :: else -> break
    od;
    r = 0;
    do
    :: r < N * N -> assert(len(link[r]) == 0); r++
    :: else -> break
    od;
    assert(ALL_TRAINED)
}
