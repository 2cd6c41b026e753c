//! Model routing: a wrapper backend that sends a call whose `options.model` matches a route
//! to that route's backend, with the model name the route maps it to; every other call goes
//! to the default backend unchanged. Routes are tried in order; a pattern is an exact model
//! name, or a prefix followed by `*`.

use super::{AgentBackend, AgentReply, AgentRequest, BackendError, BackendRef};
use futures::future::BoxFuture;
use std::sync::Arc;

/// One route: calls for models matching `pattern` go to `backend` as `model`.
#[derive(Clone)]
pub struct Route {
    /// An exact model name, or a prefix ending in `*`.
    pub pattern: String,
    /// Where matching calls go.
    pub backend: Arc<dyn AgentBackend>,
    /// The model name sent instead (`None`: the requested name).
    pub model: Option<String>,
}

impl Route {
    /// Whether the route takes calls for `model`.
    pub fn matches(&self, model: &str) -> bool {
        match self.pattern.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => self.pattern == model,
        }
    }
}

/// The routing backend.
pub struct Router {
    default: Arc<dyn AgentBackend>,
    routes: Vec<Route>,
}

impl Router {
    /// Route calls by model over `default`.
    pub fn new(default: Arc<dyn AgentBackend>, routes: Vec<Route>) -> Self {
        Router { default, routes }
    }

    /// Which backend and model a call for `model` goes to.
    pub fn route(&self, model: Option<&str>) -> (Arc<dyn AgentBackend>, Option<String>) {
        let Some(model) = model else { return (self.default.clone(), None) };
        match self.routes.iter().find(|r| r.matches(model)) {
            Some(route) => (route.backend.clone(), Some(route.model.clone().unwrap_or_else(|| model.to_string()))),
            None => (self.default.clone(), Some(model.to_string())),
        }
    }
}

impl AgentBackend for Router {
    fn name(&self) -> String {
        self.default.name()
    }

    fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
        let (backend, model) = self.route(request.model.as_deref());
        if model == request.model {
            return backend.call(request);
        }
        let routed = AgentRequest { model, ..(*request).clone() };
        backend.call(Arc::new(routed))
    }

    fn reference(&self) -> BackendRef {
        self.default.reference()
    }

    fn unpriced(&self, model: Option<&str>) -> Option<String> {
        let (backend, model) = self.route(model);
        backend.unpriced(model.as_deref())
    }

    fn free_notice(&self, model: Option<&str>) -> Option<String> {
        let (backend, model) = self.route(model);
        backend.free_notice(model.as_deref())
    }

    fn with_grants(&self, grants: &[String]) -> Option<Arc<dyn AgentBackend>> {
        let granted = |b: &Arc<dyn AgentBackend>| b.with_grants(grants).unwrap_or_else(|| b.clone());
        let routes = self.routes.iter().map(|r| Route { backend: granted(&r.backend), ..r.clone() }).collect();
        Some(Arc::new(Router::new(granted(&self.default), routes)))
    }

    fn hiding(&self, hidden: &super::Hidden) -> Option<Arc<dyn AgentBackend>> {
        let hid = |b: &Arc<dyn AgentBackend>| b.hiding(hidden).unwrap_or_else(|| b.clone());
        let routes = self.routes.iter().map(|r| Route { backend: hid(&r.backend), ..r.clone() }).collect();
        Some(Arc::new(Router::new(hid(&self.default), routes)))
    }

    fn flows(&self) -> Vec<Arc<super::flow::Flow>> {
        let mut flows = self.default.flows();
        for route in &self.routes {
            for flow in route.backend.flows() {
                if !flows.iter().any(|f| Arc::ptr_eq(f, &flow)) {
                    flows.push(flow);
                }
            }
        }
        flows
    }

    fn describe(&self) -> String {
        let mut text = self.default.describe();
        for route in &self.routes {
            text.push_str(&format!("; models `{}` go to {}", route.pattern, route.backend.describe()));
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DryRun;

    struct Named(&'static str);
    impl AgentBackend for Named {
        fn name(&self) -> String {
            self.0.to_string()
        }
        fn call(&self, request: Arc<AgentRequest>) -> BoxFuture<'static, Result<AgentReply, BackendError>> {
            let text = format!("{}:{}", self.0, request.model.clone().unwrap_or_default());
            Box::pin(async move { Ok(AgentReply::new(text, None)) })
        }
    }

    #[tokio::test]
    async fn routes_by_exact_name_then_prefix_in_order() {
        let router = Router::new(
            Arc::new(Named("default")),
            vec![
                Route { pattern: "fast".into(), backend: Arc::new(Named("local")), model: Some("qwen".into()) },
                Route { pattern: "claude-*".into(), backend: Arc::new(Named("anthropic")), model: None },
                Route { pattern: "*".into(), backend: Arc::new(DryRun), model: None },
            ],
        );
        let call = |model: Option<&str>| {
            Arc::new(AgentRequest {
                prompt: "p".into(),
                label: None,
                model: model.map(str::to_string),
                schema: None,
                attempt: 0,
                feedback: None,
                limits: Default::default(),
                tuning: Default::default(),
            })
        };
        assert_eq!(router.call(call(Some("fast"))).await.unwrap().text, "local:qwen");
        assert_eq!(router.call(call(Some("claude-x"))).await.unwrap().text, "anthropic:claude-x");
        assert_eq!(router.call(call(None)).await.unwrap().text, "default:");
        assert!(router.call(call(Some("other"))).await.unwrap().text.starts_with("[dry-run"));
    }
}
