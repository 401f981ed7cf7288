//! The worker's generation: a prepared request admitted as a sequence, the step that
//! advances every model's sequences and sends what they report, and embeddings.

use super::*;

impl Worker {
    /// Adds a prepared generation to its model's running sequences, or hands it back
    /// when its KV claim does not fit beside theirs yet.
    pub(super) fn start_generation(&mut self, r: Ready) -> Result<Began, JobError> {
        let Some(i) = self.slots.iter().position(|s| Arc::ptr_eq(&s.kit, &r.kit)) else {
            // Its model was unloaded meanwhile (it is kept while its requests are being
            // prepared, so only by an error): prepare it again.
            let job = r.prepared?.job;
            return self.start_preparing(job, &r.events, r.admitted);
        };
        let Prepared { job, prompt, param, ctx, grammar, grammar_param, tools, reasoning, harmony } = r.prepared?;
        let (events, admitted, load) = (&r.events, r.admitted, r.load);
        if job.count_only {
            let _ = events.send(Event::Started { prompt_tokens: prompt.len(), cached_tokens: 0 });
            return Ok(Began::Done);
        }
        let slot = &mut self.slots[i];
        let engine = &slot.engine;
        if let Some((s, field)) = job.sparse_ffn
            && !s.is_off()
            && engine.model.config().neuron_group.is_none()
        {
            let why = strata_model::sparse::without_bundles(engine.model.config(), &job.model);
            return Err(invalid(Some(field), format!("`{field}` {s}: {why}")));
        }
        let claim = kv_claim(slot, ctx, job.max_tokens, prompt.len());
        if claim > slot.kv_limit {
            let positions = claim / slot.position_bytes.max(1);
            return Err(invalid(
                Some(if job.max_tokens.is_some() { "max_tokens" } else { param }),
                format!(
                    "this request may reach {positions} positions, whose KV cache needs {}; the model's KV memory \
                     (--kv-memory) holds {} ({} positions); ask for fewer tokens or a smaller context",
                    human_size(claim),
                    human_size(slot.kv_limit),
                    slot.kv_limit / slot.position_bytes.max(1)
                ),
            ));
        }
        // `ready_to_run` could count only its token limit: with the prompt, it may have to
        // wait for running sequences to finish.
        if slot.running.iter().map(|r| r.kv_claim).sum::<u64>() + claim > slot.kv_limit {
            let prepared = Prepared { job, prompt, param, ctx, grammar, grammar_param, tools, reasoning, harmony };
            return Ok(Began::Wait(Box::new(Ready { prepared: Ok(prepared), ..r })));
        }
        // Room for it: caches kept for reuse give way, least recently used first.
        while slot.claimed() + claim > slot.kv_limit && !slot.idle.is_empty() {
            slot.idle.remove(0);
        }
        // The kept cache that shares the longest prefix with this prompt, when that is
        // most of what it holds; otherwise a new one, so that a conversation's cache is
        // not spent on a request that shares only a chat template's first tokens with it
        // (the oldest kept caches give way when there are too many, see `step`).
        let best = slot
            .idle
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| c.capacity() == ctx)
            .map(|(n, (_, t))| (n, t.iter().zip(&prompt).take_while(|(a, b)| a == b).count(), t.len()))
            .max_by_key(|&(n, common, _)| (common, n))
            .filter(|&(_, common, held)| 2 * common >= held);
        let (mut cache, cached) = match best {
            Some((n, _, _)) => slot.idle.remove(n),
            None => (engine.model.new_cache(ctx).map_err(|e| model_error(&job.model, e))?, Vec::new()),
        };
        cache.sparse_ffn = job.sparse_ffn.map(|(s, _)| s);
        let (grammar, constraint) = grammar.unzip();
        let req = GenerateRequest {
            max_tokens: job.max_tokens.unwrap_or(usize::MAX),
            prompt,
            sampling: job.sampling.clone(),
            stop: job.stop.clone(),
            stop_at_eos: true,
            top_logprobs: job.top_logprobs,
            grammar,
            // Markers may be special tokens (Mistral's `[TOOL_CALLS]`, `[THINK]`).
            keep_special_tokens: tools.is_some() || reasoning.is_some() || harmony.is_some(),
            speculative: job.speculative,
        };
        let seq = Sequence::with_constraint(engine, cache, cached, req, constraint)
            .map_err(|e| generate_error(&job.model, param, e))?;
        tracing::debug!(model = %slot.name, prompt = seq.request().prompt.len(), to_run = seq.prompt_left(), "admitted");
        let _ =
            events.send(Event::Started { prompt_tokens: seq.request().prompt.len(), cached_tokens: seq.cached_len() });
        slot.running.push(Running {
            seq,
            events: events.clone(),
            param,
            grammar_param,
            admitted,
            load,
            kv_claim: claim,
            tools,
            reasoning,
            harmony,
            counted: 0,
            reasoning_tokens: 0,
        });
        Ok(Began::Running)
    }

    /// One forward pass over each model's running sequences; then their events go out
    /// and the finished ones retire.
    pub(super) fn step(&mut self) {
        let shutting_down = self.status.shutting_down.clone();
        let chunk = self.config.prefill_chunk.max(1);
        // Replies go out once /api/ps is current (a `keep_alive: 0` model unloaded).
        let mut replies = Vec::new();
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if slot.running.is_empty() {
                continue;
            }
            for r in slot.running.iter_mut().filter(|r| r.events.is_closed()) {
                r.seq.cancel();
            }
            // The pass stops within a layer when every client has gone, or on shutdown.
            let senders: Vec<_> = slot.running.iter().map(|r| r.events.clone()).collect();
            let cancelled = || shutting_down.load(Ordering::Relaxed) || senders.iter().all(|e| e.is_closed());
            let engine = &slot.engine;
            let mut seqs: Vec<&mut Sequence> = slot.running.iter_mut().map(|r| &mut r.seq).collect();
            let started = Instant::now();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                batch::step(engine, &mut seqs, chunk, &cancelled)
            }));
            drop(seqs);
            if let Ok(Ok(ran)) = &result {
                let ms = started.elapsed().as_secs_f64() * 1e3;
                tracing::debug!(model = %slot.name, sequences = ran, ms, "step");
            }
            let failure = match result {
                Ok(Ok(_)) | Ok(Err(ModelError::Cancelled)) => None,
                Ok(Err(e)) => Some(model_error(&slot.name, e)),
                Err(panic) => {
                    slot.running.iter_mut().for_each(|r| r.seq.cancel());
                    Some(JobError::Internal(panic_message(&*panic)))
                }
            };
            let failure = file_fault(slot).or(failure);
            let tok = &slot.engine.tokenizer;
            let piece = |id: u32| TokenLogprob {
                id,
                text: tok.decode(&[id], false).unwrap_or_default(),
                bytes: tok.token_bytes(id),
                logprob: 0.0,
            };
            for r in slot.running.iter_mut() {
                let mut sent = true;
                let mut out = Vec::new();
                let events: Vec<TokenEvent> = r.seq.drain_events().collect();
                // A step may generate several tokens (speculative decoding): each token
                // with the text after it, as a step of that token alone would report it.
                let mut tokens = r.counted;
                let mut thinking_before = r.thinking();
                for ev in events {
                    match ev {
                        TokenEvent::Text(t) => r.text(t, &mut out),
                        TokenEvent::Token { id, logprob, top } => {
                            if tokens > r.counted {
                                // The previous token's step ends here: a reply complete
                                // there ends before this token, as it would have.
                                if r.closed() {
                                    r.seq.stop_after(tokens);
                                    break;
                                }
                                r.count_token(thinking_before);
                            }
                            thinking_before = r.thinking();
                            tokens += 1;
                            out.push(Event::Token {
                                sampled: TokenLogprob { logprob, ..piece(id) },
                                top: top
                                    .into_iter()
                                    .map(|(id, logprob)| TokenLogprob { logprob, ..piece(id) })
                                    .collect(),
                            })
                        }
                    }
                }
                if tokens > r.counted {
                    r.count_token(thinking_before);
                }
                if r.closed() {
                    r.seq.stop();
                }
                if r.seq.is_finished() {
                    r.finish_text(&mut out);
                }
                for ev in out {
                    sent &= r.events.send(ev).is_ok();
                }
                if !sent {
                    r.seq.cancel();
                }
            }
            // Retire the finished: their caches stay for a follow-up request.
            let mut n = 0;
            while n < slot.running.len() {
                if !slot.running[n].seq.is_finished() {
                    n += 1;
                    continue;
                }
                let mut r = slot.running.remove(n);
                self.admission.lock().expect("admission lock").finish();
                let error = r
                    .seq
                    .take_error()
                    .map(|e| match e {
                        GenerateError::Grammar(_) => invalid(Some(r.grammar_param), e),
                        e => generate_error(&slot.name, r.param, e),
                    })
                    .or_else(|| failure.clone());
                let summary = r.seq.summary().expect("a finished sequence has a summary");
                let mut context = r.seq.request().prompt.clone();
                let (tool_calls, tool_cut) = r.calls();
                let (cache, tokens) = r.seq.into_cache();
                match error {
                    Some(e) => replies.push((r.events, Event::Error(e))),
                    None => {
                        context.extend(&summary.tokens);
                        let done = Event::Done(JobDone {
                            finish: summary.finish,
                            prompt_tokens: summary.prompt_tokens,
                            completion_tokens: summary.completion_tokens,
                            cached_tokens: summary.cached_tokens,
                            reasoning_tokens: r.reasoning_tokens,
                            stop_sequence: summary.stop_sequence.clone(),
                            context,
                            load: r.load,
                            prefill: summary.prefill,
                            decode: summary.decode,
                            total: r.admitted.elapsed(),
                            tool_calls,
                            tool_cut,
                            speculative: summary.speculative,
                        });
                        replies.push((r.events, done));
                    }
                }
                slot.idle.push((cache, tokens));
                if slot.idle.len() > slot.parallel {
                    slot.idle.remove(0);
                }
            }
        }
        if !replies.is_empty() {
            // Keep-alive counts from the end of use; `keep_alive: 0` unloads right away.
            let now = Instant::now();
            for slot in self.slots.iter_mut().filter(|s| !s.in_use()) {
                if let KeepAlive::For(d) = slot.keep_alive {
                    slot.expires = Some(now + d);
                }
            }
            self.slots.retain(|s| s.in_use() || s.keep_alive != KeepAlive::For(Duration::ZERO));
            self.publish();
        }
        for (events, reply) in replies {
            let _ = events.send(reply);
        }
    }

    pub(super) fn embed(
        &mut self,
        job: EmbedJob,
        events: &tokio::sync::mpsc::UnboundedSender<Event>,
        cancelled: &(dyn Fn() -> bool + Sync),
        admitted: Instant,
    ) -> Result<(), JobError> {
        let load_start = Instant::now();
        let i = self.slot(&job.model)?;
        let load = load_start.elapsed();
        self.touch(i, job.keep_alive);
        let engine = &self.slots[i].engine;
        let vocab = engine.model.config().vocab_size;
        // No KV budget covers an embedding: `num_ctx` may only shorten the context.
        let ctx = job.num_ctx.map_or(engine.context_len, |n| n.clamp(1, engine.context_len.max(1)));
        let mut vectors = Vec::with_capacity(job.inputs.len());
        let mut prompt_tokens = 0;
        for (n, input) in job.inputs.iter().enumerate() {
            // A text far past the context is tokenized at its ends only: a cut keeps its
            // first `ctx` tokens.
            let (mut ids, whole) = match input {
                EmbedInput::Text(t) => {
                    let b = bounded_encode(&engine.tokenizer, t, true, ctx).map_err(|e| text_error("input", e))?;
                    (b.tokens, b.whole)
                }
                EmbedInput::Tokens(ids) => (ids.clone(), true),
            };
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(invalid(
                    Some("input"),
                    format!("token id {bad} is outside the vocabulary ({vocab} tokens)"),
                ));
            }
            if ids.is_empty() {
                return Err(invalid(Some("input"), format!("input {n} is empty")));
            }
            if ids.len() > ctx {
                if !job.truncate {
                    return Err(invalid(
                        Some("input"),
                        format!(
                            "input {n} is {}{} tokens long; the context holds {ctx}",
                            if whole { "" } else { "more than " },
                            ids.len()
                        ),
                    ));
                }
                ids.truncate(ctx);
            }
            prompt_tokens += ids.len();
            match engine.model.embed(&ids, cancelled) {
                Ok(v) => vectors.push(v),
                Err(ModelError::Cancelled) => return Ok(()),
                Err(e) => return Err(model_error(&job.model, e)),
            }
        }
        if self.slots[i].keep_alive == KeepAlive::For(Duration::ZERO) {
            self.slots.remove(i);
        }
        self.publish();
        let _ = events.send(Event::Embeddings { vectors, prompt_tokens, load, total: admitted.elapsed() });
        Ok(())
    }
}
