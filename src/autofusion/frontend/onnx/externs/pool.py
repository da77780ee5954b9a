"""Pooling"""
