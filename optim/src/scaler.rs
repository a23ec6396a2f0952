//! The AMP loss scaler, as `torch.amp.GradScaler`.

use serde::{Deserialize, Serialize};

use crate::OptimError;

/// The scaler's constants, with PyTorch's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GradScalerConfig {
    /// The first scale (default 2^16).
    pub init_scale: f64,
    /// Factor applied after `growth_interval` steps without overflow (default 2).
    pub growth_factor: f64,
    /// Factor applied on an overflowing step (default 0.5).
    pub backoff_factor: f64,
    /// Consecutive finite steps before the scale grows (default 2000).
    pub growth_interval: u32,
}

impl Default for GradScalerConfig {
    fn default() -> Self {
        Self {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl GradScalerConfig {
    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), OptimError> {
        let init = self.init_scale as f32;
        if !init.is_normal() || init < 0.0 {
            return Err(OptimError::invalid(
                "init_scale",
                format!("must be a positive normal f32, got {}", self.init_scale),
            ));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return Err(OptimError::invalid(
                "growth_factor",
                format!("must be finite and > 1, got {}", self.growth_factor),
            ));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return Err(OptimError::invalid(
                "backoff_factor",
                format!("must be in (0, 1), got {}", self.backoff_factor),
            ));
        }
        if self.growth_interval == 0 {
            return Err(OptimError::invalid("growth_interval", "must be > 0"));
        }
        Ok(())
    }
}

/// What one [`GradScaler::update`] did to the scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScaleUpdate {
    /// No overflow and the interval is not complete: the scale is unchanged.
    Unchanged,
    /// The interval completed and the scale grew.
    Grew,
    /// The interval completed but the grown scale would not be finite: kept.
    GrowthRefused,
    /// The step overflowed: the scale backed off and the tracker reset.
    BackedOff,
}

/// The dynamic loss scale of mixed-precision training, with PyTorch's
/// `_amp_update_scale_` semantics. The scale is an f32, as PyTorch's is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradScaler {
    config: GradScalerConfig,
    scale: f32,
    growth_tracker: u32,
}

impl GradScaler {
    /// A scaler at `config.init_scale`; refuses an invalid config.
    pub fn new(config: GradScalerConfig) -> Result<Self, OptimError> {
        config.validate()?;
        Ok(Self {
            scale: config.init_scale as f32,
            config,
            growth_tracker: 0,
        })
    }

    /// The current scale to multiply the loss by.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// `1 / scale`, computed in f64 then rounded, as PyTorch does, for the
    /// unscale kernel.
    pub fn inv_scale(&self) -> f32 {
        (1.0 / f64::from(self.scale)) as f32
    }

    /// Consecutive finite steps since the last growth or backoff.
    pub fn growth_tracker(&self) -> u32 {
        self.growth_tracker
    }

    /// The constants this scaler was built with.
    pub fn config(&self) -> &GradScalerConfig {
        &self.config
    }

    /// Records one step. An overflow multiplies the scale by the backoff
    /// factor and resets the tracker; `growth_interval` finite steps in a row
    /// multiply it by the growth factor if the result stays finite. A scale
    /// that would become 0 or subnormal is refused and nothing changes.
    pub fn update(&mut self, found_inf: bool) -> Result<ScaleUpdate, OptimError> {
        if found_inf {
            let backed_off = (f64::from(self.scale) * self.config.backoff_factor) as f32;
            if !backed_off.is_normal() {
                return Err(OptimError::ScaleOutOfRange {
                    scale: f64::from(backed_off),
                    reason: "backing off would make the scale 0 or subnormal".into(),
                });
            }
            self.scale = backed_off;
            self.growth_tracker = 0;
            return Ok(ScaleUpdate::BackedOff);
        }
        let successful = self.growth_tracker.saturating_add(1);
        if successful < self.config.growth_interval {
            self.growth_tracker = successful;
            return Ok(ScaleUpdate::Unchanged);
        }
        self.growth_tracker = 0;
        let grown = (f64::from(self.scale) * self.config.growth_factor) as f32;
        if grown.is_finite() {
            self.scale = grown;
            Ok(ScaleUpdate::Grew)
        } else {
            Ok(ScaleUpdate::GrowthRefused)
        }
    }
}
