/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fer_share.c - docs/design.md §7.1: a weighted fair share of the lanes per client, inside the
 * admission decision.
 *
 * A client is whoever a request names in client_id (its session_id when it names none). The core
 * tracks up to max_clients of them in a fixed table, with fair_share on or off (both it and
 * client_weights are live: fer_core_set_fair_share, fer_core_set_client_weights), and keeps, per
 * client, its committed work: the remaining NFE of its queued and running requests, exact at
 * every accept, step and end. The share of client k is weight_k / (the weights of the clients
 * with committed work), and k is over its share when committed_k / (all committed work) is
 * more than that. fer_submit.c uses this at step 6 (a full queue) and step 7 (the admission
 * test): a request of a client that is not over its share may displace queued work of clients
 * that are, up to FER_SHARE_VICTIMS requests per decision.
 *
 * Everything runs with core->mu held, in O(max_clients + queue) per call, without allocating.
 * A client is found through a hash index like the session table's; only making room for a new
 * client scans the table (for the least recently active idle one), as sessions do.
 */
#include <string.h>

#include "fer_internal.h"

/* One pattern element at p[*pi] against character ch: '?', a closed [...] / [!...] class (ranges
 * a-z; a reversed range matches nothing), or a literal (an unclosed '[' is one too, as in
 * fnmatch). Advances *pi past the element. */
static int glob_element(const char *p, uint32_t plen, uint32_t *pi, char ch)
{
    uint32_t i = *pi, j, k;
    int neg, hit = 0;

    if (p[i] == '?') {
        *pi = i + 1;
        return 1;
    }
    if (p[i] == '[') {
        j = i + 1;
        if (j < plen && p[j] == '!')
            j++;
        if (j < plen && p[j] == ']')
            j++;
        while (j < plen && p[j] != ']')
            j++;
        if (j < plen) { /* a class: p[i+1 .. j) */
            k = i + 1;
            neg = p[k] == '!';
            k += (uint32_t)neg;
            while (k < j) {
                if (k + 2 < j && p[k + 1] == '-') {
                    hit |= p[k] <= ch && ch <= p[k + 2];
                    k += 3;
                } else {
                    hit |= p[k] == ch;
                    k++;
                }
            }
            *pi = j + 1;
            return neg ? !hit : hit;
        }
    }
    *pi = i + 1;
    return p[i] == ch;
}

int fer_glob_match(const char *p, uint32_t plen, const char *s, uint32_t slen)
{
    uint32_t pi = 0, si = 0, star_p = FER_NONE, star_s = 0, next;

    /* Greedy with backtracking to the last '*': O(plen x slen), both <= FER_SESSION_ID_MAX. */
    while (si < slen) {
        if (pi < plen && p[pi] == '*') {
            star_p = ++pi;
            star_s = si;
            continue;
        }
        next = pi;
        if (pi < plen && glob_element(p, plen, &next, s[si])) {
            pi = next;
            si++;
            continue;
        }
        if (star_p == FER_NONE)
            return 0;
        pi = star_p;
        si = ++star_s;
    }
    while (pi < plen && p[pi] == '*')
        pi++;
    return pi == plen;
}

int fer_core_set_fair_share(struct fer_core *c, uint32_t on)
{
    FER_CHECK_ARGS(c != NULL && on <= 1);
    pthread_mutex_lock(&c->mu);
    c->cfg.fair_share = on; /* read under mu by every decision: the next one sees it whole */
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

static uint32_t weight_of(const struct fer_core *c, const char *id, uint32_t len);

int fer_core_set_client_weights(struct fer_core *c, const struct fer_client_weight *rules,
                                uint32_t n)
{
    uint32_t i, k;

    FER_CHECK_ARGS(c != NULL && n <= FER_WEIGHT_RULES && (rules != NULL || n == 0));
    for (i = 0; i < n; i++)
        FER_CHECK_ARGS(rules[i].len <= FER_SESSION_ID_MAX && rules[i].weight >= 1 &&
                       rules[i].weight <= FER_WEIGHT_MAX);
    pthread_mutex_lock(&c->mu);
    if (n > 0)
        memcpy(c->rules, rules, n * sizeof(*rules));
    c->nrules = n;
    /* Every tracked client takes its weight under the new rules; the active weights follow. */
    c->share_weight = 0;
    for (k = 0; k < c->cfg.max_clients; k++) {
        struct fer_client *q = &c->clients[k];
        if (!q->in_use)
            continue;
        q->weight = weight_of(c, q->id, q->len);
        if (q->committed > 0)
            c->share_weight += q->weight;
    }
    pthread_mutex_unlock(&c->mu);
    return FER_OK;
}

uint32_t fer_client_find(const struct fer_core *c, const struct fer_request *r)
{
    const char *id;
    uint32_t len, e;
    uint64_t h, i;

    fer_client_key(r, &id, &len);
    h = fer_session_hash(id, len);
    /* The index is at least twice max_clients, so an empty bucket always ends the probe. */
    for (i = h & c->client_hash_mask; (e = c->client_hash[i]) != 0;
         i = (i + 1) & c->client_hash_mask) {
        const struct fer_client *q = &c->clients[e - 1];
        if (q->hash == h && q->len == len && memcmp(q->id, id, len) == 0)
            return e - 1;
    }
    return FER_NONE;
}

static uint64_t client_hash_of(const struct fer_core *c, uint32_t k)
{
    return c->clients[k].hash;
}

int fer_client_room(const struct fer_core *c, uint32_t *evict)
{
    uint32_t k;

    *evict = FER_NONE;
    if (c->nclients < c->cfg.max_clients)
        return FER_OK;
    for (k = 0; k < c->cfg.max_clients; k++)
        if (c->clients[k].outstanding == 0 &&
            (*evict == FER_NONE || c->clients[k].touch < c->clients[*evict].touch))
            *evict = k;
    return *evict == FER_NONE ? FER_EFULL : FER_OK;
}

/* The weight a new client gets: the first rule whose pattern matches its id, else 1. */
static uint32_t weight_of(const struct fer_core *c, const char *id, uint32_t len)
{
    uint32_t i;

    for (i = 0; i < c->nrules; i++)
        if (fer_glob_match(c->rules[i].pattern, c->rules[i].len, id, len))
            return c->rules[i].weight;
    return 1;
}

uint32_t fer_client_accept(struct fer_core *c, const struct fer_request *r, uint32_t ki,
                           uint32_t evict, uint32_t id, uint64_t now)
{
    struct fer_slot *s = &c->slots[id];
    struct fer_client *q;

    if (evict != FER_NONE) {
        fer_index_remove(c->client_hash, c->client_hash_mask, c->clients[evict].hash, evict,
                         client_hash_of, c);
        c->clients[evict].in_use = 0;
        c->nclients--;
        c->st.clients_evicted++;
    }
    if (ki == FER_NONE) {
        for (ki = 0; c->clients[ki].in_use; ki++) /* a free entry exists: fer_client_room */
            ;
        q = &c->clients[ki];
        memset(q, 0, sizeof(*q));
        memcpy(q->id, s->client_id, s->client_id_len);
        q->len = s->client_id_len;
        q->hash = fer_session_hash(q->id, q->len);
        q->weight = weight_of(c, q->id, q->len);
        q->in_use = 1;
        c->nclients++;
        fer_index_insert(c->client_hash, c->client_hash_mask, q->hash, ki);
    }
    q = &c->clients[ki];
    if (q->committed == 0)
        c->share_weight += q->weight;
    q->committed += s->remaining_nfe;
    q->outstanding++;
    q->admitted_nfe += s->remaining_nfe;
    q->touch = ++c->client_touch;
    q->last_active_ns = now;
    c->share_total += s->remaining_nfe;
    s->client = ki;
    (void)r;
    return ki;
}

void fer_client_uncommit(struct fer_core *c, const struct fer_slot *s, uint64_t n)
{
    struct fer_client *q;

    if (s->client == FER_NONE || n == 0)
        return;
    q = &c->clients[s->client];
    q->committed -= n;
    c->share_total -= n;
    if (q->committed == 0)
        c->share_weight -= q->weight;
}

void fer_client_detach(struct fer_core *c, const struct fer_slot *s)
{
    if (s->client == FER_NONE)
        return;
    fer_client_uncommit(c, s, s->remaining_nfe);
    c->clients[s->client].outstanding--;
}

uint32_t fer_client_weight(const struct fer_core *c, const struct fer_request *r, uint32_t ki)
{
    const char *id;
    uint32_t len;

    if (ki != FER_NONE)
        return c->clients[ki].weight;
    fer_client_key(r, &id, &len);
    return weight_of(c, id, len);
}

/* What client k has committed in the state cut describes (x's NFE added to x's client). */
static uint64_t committed_in(const struct fer_core *c, uint32_t k, const struct fer_share_cut *cut)
{
    uint64_t n = c->clients[k].committed + (k == cut->xk ? cut->xnfe : 0);
    uint32_t i;

    for (i = 0; i < cut->n; i++)
        if (c->slots[cut->slots[i]].client == k)
            n -= c->slots[cut->slots[i]].remaining_nfe;
    return n;
}

int fer_client_over(const struct fer_core *c, uint32_t ki, const struct fer_share_cut *cut)
{
    uint64_t committed, weight_of_k, total = c->share_total + cut->xnfe;
    uint64_t weight = c->share_weight;
    uint32_t i, j, k;

    /* x's client is active with x, whether or not it was before. */
    if (cut->xk == FER_NONE || c->clients[cut->xk].committed == 0)
        weight += cut->xweight;
    /* The cut leaves the total, and a client it empties leaves the active weights (once). */
    for (i = 0; i < cut->n; i++) {
        k = c->slots[cut->slots[i]].client;
        if (k == FER_NONE) /* accepted uncharged (fair_share off, table full): not in the totals */
            continue;
        total -= c->slots[cut->slots[i]].remaining_nfe;
        for (j = 0; j < i && c->slots[cut->slots[j]].client != k; j++)
            ;
        if (j == i && committed_in(c, k, cut) == 0)
            weight -= c->clients[k].weight;
    }
    if (ki == FER_NONE) { /* x's untracked client: x is all it has */
        committed = cut->xnfe;
        weight_of_k = cut->xweight;
    } else {
        committed = committed_in(c, ki, cut);
        weight_of_k = c->clients[ki].weight;
    }
    if (committed == 0)
        return 0;
    return (unsigned __int128)committed * weight > (unsigned __int128)weight_of_k * total;
}

/* Whether queued slot id stays in the simulated queue: not cancelled by r, not in cut. */
static int retained(const struct fer_core *c, const struct fer_request *r, uint32_t si,
                    const struct fer_share_cut *cut, uint32_t id)
{
    uint32_t i;

    if (fer_cancels(&c->slots[id], si, r->generation))
        return 0;
    for (i = 0; i < cut->n; i++)
        if (cut->slots[i] == id)
            return 0;
    return 1;
}

/* Whether client a uses more of its weight than client b in the state cut describes:
 * committed_a / weight_a > committed_b / weight_b, exactly. */
static int uses_more(const struct fer_core *c, uint32_t a, uint32_t b,
                     const struct fer_share_cut *cut)
{
    return (unsigned __int128)committed_in(c, a, cut) * c->clients[b].weight >
           (unsigned __int128)committed_in(c, b, cut) * c->clients[a].weight;
}

uint32_t fer_share_victim(const struct fer_core *c, const struct fer_request *r, uint32_t si,
                          const struct fer_share_cut *cut, uint32_t limit, uint32_t xq)
{
    uint32_t i, id, k, bk = FER_NONE, best = FER_NONE, best_ahead = 0, ahead;
    int better;

    for (i = limit < c->qlen ? limit : c->qlen; i-- > 0;) {
        id = c->queue[i];
        k = c->slots[id].client;
        if (k == FER_NONE || !retained(c, r, si, cut, id) || !fer_client_over(c, k, cut))
            continue;
        /* the client furthest over its share first; then, for the admission test, work ahead
         * of x, then the most NFE; then the latest (found first: ties keep it) */
        ahead = xq != FER_NONE && i < xq;
        if (best == FER_NONE || (k != bk && uses_more(c, k, bk, cut)))
            better = 1;
        else if (k != bk && uses_more(c, bk, k, cut))
            better = 0;
        else if (xq == FER_NONE || ahead != best_ahead)
            better = ahead > best_ahead;
        else
            better = c->slots[id].remaining_nfe > c->slots[best].remaining_nfe;
        if (better) {
            best = id;
            bk = k;
            best_ahead = ahead;
        }
    }
    return best;
}

uint32_t fer_share_job_limit(const struct fer_core *c, const struct fer_request *r, uint32_t si,
                             const struct fer_share_cut *cut, uint32_t xq, uint32_t m)
{
    uint32_t i, j = 0;

    for (i = 0; i <= c->qlen; i++) {
        if (i == xq && j++ == m)
            return xq;
        if (i < c->qlen && retained(c, r, si, cut, c->queue[i]) && j++ == m)
            return i + 1;
    }
    return c->qlen;
}

int fer_core_clients_snapshot(struct fer_core *c, struct fer_client_state *out, uint32_t max_n)
{
    uint32_t k, n = 0;

    FER_CHECK_ARGS(c != NULL && (out != NULL || max_n == 0));
    pthread_mutex_lock(&c->mu);
    for (k = 0; k < c->cfg.max_clients && n < max_n; k++) {
        const struct fer_client *q = &c->clients[k];
        if (!q->in_use)
            continue;
        memset(&out[n], 0, sizeof(out[n]));
        memcpy(out[n].client_id, q->id, q->len);
        out[n].client_id_len = q->len;
        out[n].weight = q->weight;
        out[n].committed_nfe = q->committed;
        out[n].admitted_nfe = q->admitted_nfe;
        out[n].fair_share_rejections = q->fair_rejections;
        out[n].last_active_ns = q->last_active_ns;
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    return (int)n;
}
