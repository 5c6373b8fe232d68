//! A request's run through its app's filters: each filter's HTTP context made in one of
//! its instances, its callbacks phase by phase in the app's order, the calls it dispatches
//! made and answered, and its context ended (`on_log`, `on_done`, `on_delete`) when the
//! request is done, however it ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::abi::ACTION_CONTINUE;
use crate::exchange::{
    Exchange, HttpCall, HttpCallAnswer, LocalResponse, RequestFacts, RequestHead, ResponseHead,
};
use crate::metrics;
use crate::plugin::{Callback, Failure, FailureKind, Plugin, Slot};

/// Makes the calls filters dispatch (`proxy_http_call`): the router's side.
pub trait HttpCalls {
    /// The answer to `call`, `None` when it failed or took longer than its timeout.
    fn call<'a>(
        &'a self,
        call: &'a HttpCall,
    ) -> Pin<Box<dyn Future<Output = Option<HttpCallAnswer>> + 'a>>;
}

/// What the filters say of a request at a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It goes on (edited as the filters edited it).
    Continue,
    /// A filter answered in place of the app.
    Respond(LocalResponse),
    /// This filter failed, and it fails closed: the router answers 500.
    Failed {
        /// Its name.
        filter: String,
    },
}

/// The order a phase runs the app's filters in: the request's phases in the app's, the
/// answer's backwards (the filter nearest the app first, as Envoy encodes).
#[derive(Clone, Copy)]
enum Order {
    App,
    Backwards,
}

struct Context {
    plugin: Arc<Plugin>,
    slot: Arc<Slot>,
    generation: u64,
    id: u32,
    /// False once its filter failed open: it is skipped for the rest of the request.
    alive: bool,
}

/// A request's contexts in its app's filters.
pub struct RequestFilters {
    contexts: Vec<Context>,
    /// The views each callback is given, swapped into the instance's store for its length.
    exchange: Box<Exchange>,
    /// The request's head and its answer's as last seen, for `on_log`.
    seen_request: Option<RequestHead>,
    seen_response: Option<ResponseHead>,
    /// A filter paused on the answer's head: it is handed the answer's body.
    answer_body_wanted: bool,
}

impl RequestFilters {
    /// Makes the request's context in each of `plugins`; a filter that cannot start fails
    /// open or closed as it is set to.
    pub async fn start(plugins: &[Arc<Plugin>], facts: RequestFacts) -> (Self, Verdict) {
        let mut run = RequestFilters {
            contexts: Vec::with_capacity(plugins.len()),
            exchange: Box::new(Exchange {
                facts: Some(Arc::new(facts)),
                in_request: true,
                ..Exchange::default()
            }),
            seen_request: None,
            seen_response: None,
            answer_body_wanted: false,
        };
        for plugin in plugins {
            match open_context(plugin, &mut run.exchange).await {
                Ok(context) => run.contexts.push(context),
                Err(failure) => {
                    plugin.note_failure(&failure);
                    if !plugin.fail_open {
                        return (run, failed_closed(plugin));
                    }
                }
            }
        }
        (run, Verdict::Continue)
    }

    /// `on_http_request_headers`, the body not read yet (`end_of_stream` when there is none);
    /// the head as the router then sends it is given back with [`Self::keep_for_log`].
    pub async fn request_headers(
        &mut self,
        head: &mut RequestHead,
        end_of_stream: bool,
        calls: &dyn HttpCalls,
    ) -> Verdict {
        let fields = head.headers.len() + 4;
        let callback = Callback::RequestHeaders {
            fields,
            end_of_stream,
        };
        self.each(callback, Order::App, calls, &mut |ex, put| match put {
            true => ex.request = Some(std::mem::take(head)),
            false => *head = ex.request.take().unwrap_or_default(),
        })
        .await
    }

    /// The request's head as the router sends it on, for `on_log`: its pseudo-fields, as
    /// properties and map entries (its fields are not kept for it: a map's copy on every
    /// request).
    pub fn keep_for_log(&mut self, mut head: RequestHead) {
        head.headers = http::HeaderMap::new();
        self.seen_request = Some(head);
    }

    /// `on_http_request_body`, once, with the whole body read (as Kong's module gives a
    /// buffered body); a filter may replace it.
    pub async fn request_body(
        &mut self,
        head: &RequestHead,
        body: &mut Vec<u8>,
        calls: &dyn HttpCalls,
    ) -> Verdict {
        let callback = Callback::RequestBody {
            size: body.len(),
            end_of_stream: true,
        };
        self.each(callback, Order::App, calls, &mut |ex, put| match put {
            true => {
                ex.request = Some(head.clone());
                ex.request_body = Some(std::mem::take(body));
            }
            false => *body = ex.request_body.take().unwrap_or_default(),
        })
        .await
    }

    /// `on_http_response_headers`, in the app's order backwards (the filter nearest the app
    /// first, as Envoy encodes).
    pub async fn response_headers(
        &mut self,
        head: &mut ResponseHead,
        end_of_stream: bool,
        calls: &dyn HttpCalls,
    ) -> Verdict {
        let fields = head.headers.len() + 1;
        let callback = Callback::ResponseHeaders {
            fields,
            end_of_stream,
        };
        let verdict = self
            .each(
                callback,
                Order::Backwards,
                calls,
                &mut |ex, put| match put {
                    true => ex.response = Some(std::mem::take(head)),
                    false => *head = ex.response.take().unwrap_or_default(),
                },
            )
            .await;
        self.seen_response = Some(ResponseHead {
            status: head.status,
            headers: http::HeaderMap::new(),
        });
        verdict
    }

    /// `on_http_response_body`, once, with the whole answer body; a filter may replace it.
    pub async fn response_body(
        &mut self,
        head: &ResponseHead,
        body: &mut Vec<u8>,
        calls: &dyn HttpCalls,
    ) -> Verdict {
        let callback = Callback::ResponseBody {
            size: body.len(),
            end_of_stream: true,
        };
        self.each(
            callback,
            Order::Backwards,
            calls,
            &mut |ex, put| match put {
                true => {
                    ex.response = Some(head.clone());
                    ex.response_body = Some(std::mem::take(body));
                }
                false => *body = ex.response_body.take().unwrap_or_default(),
            },
        )
        .await
    }

    /// Whether a filter paused on the answer's head (`Action::Pause`, Envoy's
    /// StopIteration): it then gets the answer's body (`response_body`); the answers of
    /// filters that went on stream by.
    pub fn wants_answer_body(&self) -> bool {
        self.answer_body_wanted && self.any_alive()
    }

    /// Whether any filter's context is alive (a request whose filters all failed open
    /// skips the rest of their phases).
    pub fn any_alive(&self) -> bool {
        self.contexts.iter().any(|c| c.alive)
    }

    /// One callback in each live context, in `order`, with the views put in before
    /// (`views(_, true)`) and taken back after; the first local answer or closed failure
    /// ends the phase.
    async fn each(
        &mut self,
        callback: Callback,
        order: Order,
        calls: &dyn HttpCalls,
        views: &mut dyn FnMut(&mut Exchange, bool),
    ) -> Verdict {
        let count = self.contexts.len();
        for turn in 0..count {
            let at = match order {
                Order::App => turn,
                Order::Backwards => count - 1 - turn,
            };
            let context = &mut self.contexts[at];
            if !context.alive {
                continue;
            }
            let exchange = &mut self.exchange;
            views(exchange, true);
            let outcome = run_callback(context, callback, exchange, calls).await;
            views(exchange, false);
            self.answer_body_wanted |= exchange.paused_for_body;
            exchange.clear_outcome();
            match outcome {
                Ok(None) => {}
                Ok(Some(local)) => return Verdict::Respond(local),
                Err(failure) => {
                    context.plugin.note_failure(&failure);
                    context.alive = false;
                    if !context.plugin.fail_open {
                        return failed_closed(&context.plugin);
                    }
                }
            }
        }
        Verdict::Continue
    }
}

impl std::fmt::Debug for RequestFilters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestFilters")
            .field("contexts", &self.contexts.len())
            .finish()
    }
}

impl Drop for RequestFilters {
    /// The contexts end (`on_log`, `on_done`, `on_delete`) when the request is done,
    /// however it ends (a client that left drops its future). Their callbacks are polled
    /// here once: a callback that neither yields nor waits for its instance ends at once,
    /// as nearly all do; what is left runs on in a task of its own.
    fn drop(&mut self) {
        let contexts = std::mem::take(&mut self.contexts);
        if contexts.is_empty() {
            return;
        }
        let mut exchange = std::mem::take(&mut self.exchange);
        exchange.request = self.seen_request.take();
        exchange.response = self.seen_response.take();
        exchange.in_request = false;
        let mut ending = Box::pin(end_contexts(contexts, exchange));
        let mut now = std::task::Context::from_waker(std::task::Waker::noop());
        if ending.as_mut().poll(&mut now).is_pending() {
            tokio::task::spawn_local(ending);
        }
    }
}

/// The live contexts' last callbacks, with the request's heads as last seen: the same
/// views for each (a callback's edits to them go nowhere).
async fn end_contexts(contexts: Vec<Context>, mut exchange: Box<Exchange>) {
    for context in contexts.into_iter().filter(|c| c.alive) {
        for callback in [Callback::Log, Callback::Done, Callback::Delete] {
            let (plugin, slot) = (&context.plugin, &context.slot);
            let ended = slot.run(
                plugin,
                context.generation,
                callback,
                context.id,
                &mut exchange,
            );
            match ended.await {
                Some(Ok(_)) => {}
                Some(Err(failure)) => {
                    plugin.note_failure(&failure);
                    break;
                }
                None => break,
            }
        }
    }
}

async fn open_context(
    plugin: &Arc<Plugin>,
    exchange: &mut Box<Exchange>,
) -> Result<Context, Failure> {
    let slot = plugin.slot();
    let mut held = slot.lock().await;
    if held.is_none() {
        *held = Some(plugin.start_instance(&slot).await?);
    }
    let Some(instance) = held.as_mut() else {
        return Err(lost());
    };
    let id = instance.next_context;
    instance.next_context = instance
        .next_context
        .wrapping_add(1)
        .max(crate::plugin::ROOT_CONTEXT + 1);
    let generation = instance.generation;
    // A context being made answers nothing and calls no one.
    exchange.in_request = false;
    let created = (instance.invoke(plugin, Callback::Create, id, exchange)).await;
    exchange.in_request = true;
    exchange.clear_outcome();
    if let Err(failure) = created {
        *held = None;
        return Err(failure);
    }
    drop(held);
    Ok(Context {
        plugin: plugin.clone(),
        slot,
        generation,
        id,
        alive: true,
    })
}

fn lost() -> Failure {
    Failure {
        kind: FailureKind::Lost,
        message: "the instance holding the request's context was stopped".into(),
    }
}

/// Runs `callback`, then the calls it dispatched, each answer delivered
/// (`on_http_call_response`), until the filter continues, answers, or fails; a paused
/// filter with nothing left to resume it has stalled.
async fn run_callback(
    context: &mut Context,
    callback: Callback,
    exchange: &mut Box<Exchange>,
    calls: &dyn HttpCalls,
) -> Result<Option<LocalResponse>, Failure> {
    let mut action = invoke(context, callback, exchange).await?;
    loop {
        if let Some(local) = exchange.local_response.take() {
            return Ok(Some(local));
        }
        let dispatched = std::mem::take(&mut exchange.calls);
        if dispatched.is_empty() {
            if action == ACTION_CONTINUE || exchange.resumed {
                return Ok(None);
            }
            if matches!(callback, Callback::ResponseHeaders { .. }) {
                // Envoy's StopIteration on the answer's head: the filter waits for the body.
                exchange.paused_for_body = true;
                return Ok(None);
            }
            return Err(Failure {
                kind: FailureKind::Stalled,
                message: "it paused the request with no call that could resume it".into(),
            });
        }
        exchange.resumed = false;
        for call in &dispatched {
            let answer = calls.call(call).await;
            metrics::HTTP_CALLS
                .with_label_values(&[if answer.is_some() {
                    "answered"
                } else {
                    "failed"
                }])
                .inc();
            let answer = answer.unwrap_or_default();
            let fields = if answer.status == 0 {
                0
            } else {
                answer.headers.len() + 1
            };
            let body = answer.body.len();
            exchange.call_answer = Some(answer);
            let delivered = Callback::HttpCallResponse {
                token: call.token,
                fields,
                body,
            };
            invoke(context, delivered, exchange).await?;
            exchange.call_answer = None;
            if exchange.local_response.is_some() {
                break;
            }
        }
        action = if exchange.resumed { ACTION_CONTINUE } else { 1 };
    }
}

async fn invoke(
    context: &mut Context,
    callback: Callback,
    exchange: &mut Box<Exchange>,
) -> Result<i32, Failure> {
    let (plugin, slot, id) = (&context.plugin, &context.slot, context.id);
    let ran = slot
        .run(plugin, context.generation, callback, id, exchange)
        .await;
    ran.unwrap_or_else(|| Err(lost()))
}

/// What a filter that fails closed says when it failed.
fn failed_closed(plugin: &Plugin) -> Verdict {
    Verdict::Failed {
        filter: plugin.name().to_string(),
    }
}
