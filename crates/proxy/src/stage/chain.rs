//! An app's chain: which stages of [`LIST`] its settings switch on, built once when the app
//! enters the route cache (and again on each change to it), as nginx builds a location's
//! phase handlers at configuration time and Envoy a route's filter chain. A request walks
//! only the stages of its app's chain: a stage the app does not use costs no check and no
//! branch on its settings, only one AND of the chain with the phase's mask.
//!
//! The stages every request needs (request id, framing, route, the ACME answer,
//! forwarding, upstream, logging) are the pipeline's own steps and not in a chain.

use switchyard_model::App;

use super::header_rules::{edits_answers, edits_requests};
use super::list::{Phase, Stage, LIST};

/// The stages an app's settings switch on, one bit each, by their place in [`LIST`]. Four
/// bytes and two flags in every cached route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Chain {
    on: u32,
    /// A stage on the chain reads the request whole: an HTTP/1.x request's fields are made
    /// a map for it.
    pub(crate) reads_whole_request: bool,
    /// A stage on the chain reads or edits the app's answer fields: they are read into a
    /// map.
    pub(crate) reads_whole_answer: bool,
}

impl Chain {
    /// The chain `app`'s settings make.
    pub(crate) fn for_app(app: &App) -> Self {
        let mut chain = Chain::default();
        for row in &LIST {
            if row.switched_on_by.is_none() || !switched_on(row.stage, app) {
                continue;
            }
            chain.on |= bit(row.stage);
            chain.reads_whole_request |= row.reads_whole_request;
            chain.reads_whole_answer |= row.reads_whole_answer;
        }
        chain
    }

    /// Whether `stage` is on the chain.
    pub(crate) const fn runs(self, stage: Stage) -> bool {
        self.on & bit(stage) != 0
    }

    /// The chain's stages that take part in `phase`, in the phase's order: the list's for
    /// the request's phases, the reverse for the answer's.
    pub(crate) fn in_phase(self, phase: Phase) -> InPhase {
        InPhase {
            left: self.on & PHASE_MASKS[phase as usize],
            backwards: phase.runs_backwards(),
        }
    }

    /// The names of the chain's stages, in list order.
    #[cfg(test)]
    pub(crate) fn names(self) -> impl Iterator<Item = &'static str> {
        LIST.iter()
            .filter(move |row| self.runs(row.stage))
            .map(|row| row.name)
    }
}

/// Whether `app`'s settings switch `stage` on: the one place a setting is tied to its stage.
fn switched_on(stage: Stage, app: &App) -> bool {
    match stage {
        Stage::Redirects => !app.redirects.is_empty(),
        Stage::AppPages => {
            app.maintenance.as_ref().is_some_and(|m| m.enabled) || app.error_pages.is_some()
        }
        Stage::Limits => app.limits.is_some(),
        Stage::Https => app.https_redirect,
        Stage::BasicAuth => app.basic_auth.is_some(),
        Stage::RequestBuffer => app.request_buffering.enabled,
        Stage::Waf => app.waf.is_some(),
        Stage::Filters => !app.filters.is_empty(),
        Stage::StaticFiles => app.static_root.is_some(),
        Stage::Affinity => app.affinity.is_some(),
        Stage::Mirror => app.mirror.is_some(),
        Stage::Cache => app.cache.is_some(),
        Stage::Images => app.images.is_some(),
        Stage::Compress => app.compress.is_some(),
        Stage::HeaderRules => edits_requests(app) || edits_answers(app),
        Stage::RequestId
        | Stage::Framing
        | Stage::Route
        | Stage::AcmeChallenge
        | Stage::FairShare
        | Stage::Forwarding
        | Stage::Upstream
        | Stage::Log => false,
    }
}

const fn bit(stage: Stage) -> u32 {
    1 << stage as u32
}

/// Each phase's stages as a mask over the list.
const PHASE_MASKS: [u32; Phase::ALL.len()] = {
    let mut masks = [0; Phase::ALL.len()];
    let mut place = 0;
    while place < LIST.len() {
        let phases = LIST[place].phases;
        let mut i = 0;
        while i < phases.len() {
            masks[phases[i] as usize] |= 1 << place;
            i += 1;
        }
        place += 1;
    }
    masks
};

/// The stages of a chain in one phase, in that phase's order.
pub(crate) struct InPhase {
    left: u32,
    backwards: bool,
}

impl Iterator for InPhase {
    type Item = Stage;

    fn next(&mut self) -> Option<Stage> {
        if self.left == 0 {
            return None;
        }
        let place = if self.backwards {
            31 - self.left.leading_zeros()
        } else {
            self.left.trailing_zeros()
        };
        self.left &= !(1 << place);
        Some(LIST[place as usize].stage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::list::declared as row;
    use serde_json::json;
    use switchyard_model::parse_app_spec;

    fn app(options: serde_json::Value) -> App {
        let mut spec = json!({"domains": ["a.test"], "backends": ["127.0.0.1:9"]});
        if let (Some(spec), Some(options)) = (spec.as_object_mut(), options.as_object()) {
            spec.extend(options.clone());
        }
        parse_app_spec("a", &spec).expect("a valid spec")
    }

    #[test]
    fn a_plain_app_buffers_bodies_and_runs_no_other_stage_of_its_own() {
        let buffering: Vec<_> = Chain::for_app(&app(json!({}))).names().collect();
        assert_eq!(buffering, ["request_buffer"]);
        let chain = Chain::for_app(&app(json!({"request_buffering": false})));
        assert_eq!(chain, Chain::default());
        for phase in Phase::ALL {
            assert_eq!(chain.in_phase(phase).count(), 0, "{}", phase.name());
        }
    }

    /// One app per stage that a setting switches on: that stage alone is on its chain.
    #[test]
    fn each_setting_switches_on_its_own_stage_alone() {
        let settings = [
            (
                Stage::Redirects,
                json!({"redirects": [{"path_prefix": "/old", "to": "/new", "status": 301}]}),
            ),
            (Stage::AppPages, json!({"maintenance": {"enabled": true}})),
            (Stage::Limits, json!({"limits": {"max_body_bytes": 1000}})),
            (Stage::Https, json!({"https_redirect": true})),
            (
                Stage::BasicAuth,
                json!({"basic_auth": {"users": {"u": "$2y$05$abcdefghijklmnopqrstuu5Fq0CPVNy2eUQx3oVbD3hrvP5lOa1Xq"}}}),
            ),
            (Stage::StaticFiles, json!({"static_root": "/srv/www"})),
            (Stage::Affinity, json!({"affinity": {"cookie": "route"}})),
            (
                Stage::Mirror,
                json!({"mirror": {"backends": ["127.0.0.1:10"]}}),
            ),
            (Stage::Cache, json!({"cache": {"paths": ["/"]}})),
            (Stage::Images, json!({"images": {}})),
            (Stage::Compress, json!({"compress": {}})),
            (
                Stage::HeaderRules,
                json!({"headers": {"response": {"set": {"x-a": "b"}}}}),
            ),
        ];
        for (stage, options) in settings {
            let chain = Chain::for_app(&app(options.clone()));
            let on: Vec<_> = chain.names().filter(|n| *n != "request_buffer").collect();
            assert_eq!(on, [row(stage).name], "{options}");
        }
    }

    #[test]
    fn answer_phases_run_backwards() {
        let chain = Chain::for_app(&app(json!({
            "cache": {"paths": ["/"]}, "compress": {}, "affinity": {"cookie": "route"},
        })));
        let answer: Vec<_> = chain.in_phase(Phase::AnswerHead).collect();
        assert_eq!(answer, [Stage::Compress, Stage::Cache, Stage::Affinity]);
        let in_place: Vec<_> = chain.in_phase(Phase::InPlaceOfApp).collect();
        assert_eq!(in_place, [Stage::Cache]);
        let head: Vec<_> = chain.in_phase(Phase::RequestHead).collect();
        assert_eq!(head, [Stage::Affinity, Stage::Compress]);
    }

    #[test]
    fn stages_that_edit_fields_leave_them_as_read_and_those_that_read_them_whole_do_not() {
        for light in [
            json!({"headers": {"request": {"set": {"x-a": "b"}}, "response": {"remove": ["server"]}}}),
            json!({"compress": {}}),
            json!({"affinity": {"cookie": "route"}}),
            json!({"limits": {"max_body_bytes": 1000}}),
        ] {
            let chain = Chain::for_app(&app(light.clone()));
            assert!(
                !chain.reads_whole_request && !chain.reads_whole_answer,
                "{light}"
            );
        }
        let cached = Chain::for_app(&app(json!({"cache": {"paths": ["/"]}, "compress": {}})));
        assert!(cached.reads_whole_request && cached.reads_whole_answer);
    }
}
